from wtx.cli import main

main()

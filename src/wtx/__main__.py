from wtx.cli import main

if __name__ == "__main__":  # not when another module imports it
    main()

#!/usr/bin/env python3
"""Render a `wtx bench --json` report as the README's Performance table (no typed numbers).

    python scripts/perf_table.py docs/bench/REPORT.json             # print the markdown
    python scripts/perf_table.py docs/bench/REPORT.json --update README.md
"""

import argparse
import json
import re
import sys
from pathlib import Path

START, END = "<!-- perf:start -->", "<!-- perf:end -->"


def render(report: dict, source: str) -> str:
    lines = [
        f"`wtx bench` on {report['device']}, {report['date'][:10]}: model {Path(report['model']).name.removesuffix('.pt')}, "
        f"{report['windows']} windows ({report['audio_seconds']:.0f} s of audio), {report['dtype']}, "
        f"median of {report['repeat']} (torch {report['versions']['torch']}, triton {report['versions']['triton']}; "
        f"raw numbers: `{source}`).",
        "",
        "| pass | median s | RTFx | tokens/s | speedup vs stock, same batch | identical windows | WER vs stock |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in report["passes"]:
        a = p.get("agreement")
        same = f"{a['identical_windows']}/{a['windows']}" if a else "baseline"
        wer = f"{a['wer']:.2%}" if a else "—"
        lines.append(f"| {p['name']} | {p['median_s']:.3f} | {p['rtfx']:.0f} | {p['tokens_per_s']:.0f} | "
                     f"{p['speedup']:.2f}x | {same} | {wer} |")  # fmt: skip
    first = (report.get("compile") or {}).get("first")
    warm = (report.get("compile") or {}).get("warm_load") or {}
    if first:
        text = f"Compile: {first['source']} in {first['seconds']:.1f} s"
        if "compile_s" in warm:
            text += f"; a fresh process {warm['source']} the artifacts in {warm['compile_s']:.1f} s"
        lines += ["", text + "."]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report", type=Path)
    parser.add_argument("--update", type=Path, help=f"replace the text between {START} and {END} in this file")
    args = parser.parse_args()
    table = render(json.loads(args.report.read_text()), str(args.report))
    if not args.update:
        print(table)
        return 0
    text = args.update.read_text()
    if START not in text or END not in text:
        sys.exit(f"{args.update}: no {START} ... {END} markers")
    text = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: f"{START}\n{table}\n{END}", text, flags=re.S)
    args.update.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Size figures of a source tree, for before/after notes on refactors (issue 28).

  code_stats.py [DIR]        # default: src/ of this checkout

Prints the lines in DIR (all files, and C++ only), the five largest files, and the five
largest functions (Universal Ctags' function spans: `ctags --fields=+ne`)."""
import os
import subprocess
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "src")
files = []
for d, _, names in os.walk(root):
    for n in names:
        p = os.path.join(d, n)
        with open(p, "rb") as f:
            files.append((f.read().count(b"\n"), os.path.relpath(p, root)))
cpp = [f for f in files if f[1].endswith((".cc", ".h"))]
print(f"lines in {os.path.normpath(root)}: {sum(n for n, _ in files)} "
      f"({len(files)} files; C++ {sum(n for n, _ in cpp)} in {len(cpp)})")
print("largest files:")
for n, p in sorted(files, reverse=True)[:5]:
    print(f"  {n:6d}  {p}")
out = subprocess.run(["ctags", "-R", "--languages=C++", "--c++-kinds=f", "--fields=+ne", "-o", "-",
                      root], capture_output=True, text=True, check=True).stdout
funcs = []
for line in out.splitlines():
    parts = line.split("\t")
    fields = dict(f.split(":", 1) for f in parts[3:] if ":" in f)
    if "line" in fields and "end" in fields:
        scope = fields.get("class", fields.get("namespace", "")).split("::")[-1]
        name = f"{scope}::{parts[0]}" if scope else parts[0]
        funcs.append((int(fields["end"]) - int(fields["line"]) + 1, name,
                      os.path.relpath(parts[1], root)))
print("largest functions:")
for n, name, p in sorted(funcs, reverse=True)[:5]:
    print(f"  {n:6d}  {name} ({p})")

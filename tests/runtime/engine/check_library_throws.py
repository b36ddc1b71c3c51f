#!/usr/bin/env python3
"""Every error the library throws derives from dscpp::Error: no `throw std::...` in the
library folders (layers 1-6 of docs/architecture.md); the launcher, tools and examples are
programs."""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
folders = ["config", "comm", "data", "ops", "nn", "optim", "model_zoo", "zero", "runtime", "pipe"]
pattern = re.compile(r"\bthrow\s+std::")
bad = []
for folder in folders:
    for path in sorted((root / folder).rglob("*")):
        if path.suffix not in (".h", ".cpp", ".cu", ".cuh"):
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            code = line.split("//", 1)[0]
            if pattern.search(code):
                bad.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
for b in bad:
    print(b)
print(f"{len(bad)} library throws of std:: types (want 0: throw dscpp::Error or a type derived from it)")
sys.exit(1 if bad else 0)

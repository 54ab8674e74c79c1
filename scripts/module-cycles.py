#!/usr/bin/env python3
"""Import cycles between sibling modules of each crate (`a` uses `b` and `b` uses `a`, directly or
through other siblings). A child using its parent's items (`super::Error`) and a parent re-exporting
its children are not cycles: those are one module and its parts. Exit 1 when a cycle is found."""
import os, re, sys
from itertools import combinations

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates")
USE = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
GROUP = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^;]*?)\}", re.S)

def modules(src):
    """Module path (tuple) of every .rs file under src."""
    found = {}
    for dirpath, _, files in os.walk(src):
        for name in files:
            if not name.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), src)[:-3].split(os.sep)
            if rel[-1] in ("mod", "lib", "main"):
                rel = rel[:-1]
            if rel and rel[0] == "bin":
                continue
            found[tuple(rel)] = os.path.join(dirpath, name)
    return found

def strip(text):
    text = re.sub(r"//[^\n]*", "", text)
    # Test modules may reach anywhere.
    cut = text.find("#[cfg(test)]")
    return text if cut < 0 else text[:cut]

def references(module, text):
    def absolute(head, tail):
        parts = [p for p in tail.split("::") if p]
        base = list(module)
        if head == "crate":
            base = []
        elif head == "super":
            base = base[:-1]
            while parts and parts[0] == "super":
                base, parts = base[:-1], parts[1:]
        return tuple(base + parts)
    for head, prefix, inner in GROUP.findall(text):
        for item in re.split(r",", inner):
            item = item.strip().split(" as ")[0].strip()
            if item:
                yield absolute(head, prefix + "::" + item.replace("{", "").replace("}", ""))
    for head, tail in USE.findall(text):
        yield absolute(head, tail)

def cycles(crate_src):
    mods = modules(crate_src)
    edges = set()
    for module, path in mods.items():
        for target in references(module, strip(open(path).read())):
            # The longest module prefix the reference names.
            while target and target not in mods:
                target = target[:-1]
            if not target or target == module:
                continue
            common = 0
            while common < min(len(module), len(target)) and module[common] == target[common]:
                common += 1
            if common == len(module) or common == len(target):
                continue  # parent and child
            edges.add((module[: common + 1], target[: common + 1]))
    found = []
    nodes = {a for a, _ in edges} | {b for _, b in edges}
    reach = {n: {b for a, b in edges if a == n} for n in nodes}
    changed = True
    while changed:
        changed = False
        for n in nodes:
            more = set().union(*(reach[m] for m in reach[n])) - reach[n] if reach[n] else set()
            if more:
                reach[n] |= more
                changed = True
    for a, b in combinations(sorted(nodes), 2):
        if b in reach[a] and a in reach[b]:
            found.append(("::".join(a), "::".join(b)))
    return found

status = 0
for crate in sorted(os.listdir(ROOT)):
    src = os.path.join(ROOT, crate, "src")
    if os.path.isdir(src):
        for a, b in cycles(src):
            print(f"{crate}: {a} <-> {b}")
            status = 1
sys.exit(status)

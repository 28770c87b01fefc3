#!/usr/bin/env python3
"""The runner's file graph, drawn from its object files' symbols.

    python tests/file_graph.py [DIR]     (DIR: daemon, after make -C daemon)

nm over DIR/*.o: a file calls (or reads) another when its object references
a symbol the other's object defines. A circle is a strongly connected
component of that graph of more than one file (Tarjan); each is printed with
the edges that make it one, then every file's calls. Exit status 1 when
there is a circle. docs/layout.md's "The runner's layers" is this graph;
tests/test_layout.py holds the daemon to it.

Only what the linker sees counts: static functions and inline functions in
headers are a file's own, and a call through a function pointer is no edge.
"""
import os
import subprocess
import sys

# nm -P types of symbols a file defines for others (global, any section).
DEFINED = set("ABCDGRSTVW")


def symbols(obj, nm="nm"):
    """(defined, referenced): the global symbols obj defines and uses."""
    out = subprocess.run([nm, "-P", obj], check=True, capture_output=True,
                         text=True).stdout
    defined, used = set(), set()
    for line in out.splitlines():
        f = line.split()
        if len(f) < 2:
            continue
        if f[1] == "U":
            used.add(f[0])
        elif f[1] in DEFINED:
            defined.add(f[0])
    return defined, used


def graph(objdir, nm="nm", sources=None):
    """{file: {file it uses: sorted symbols}} over objdir's objects, by the
    name of their source (session.o -> session). With sources, only the
    objects of a .c or .m file there: an object left behind by a source
    since removed is not drawn."""
    objs = sorted(o for o in os.listdir(objdir) if o.endswith(".o") and (
        sources is None or any(os.path.exists(os.path.join(sources, o[:-2] + e))
                               for e in (".c", ".m"))))
    defs, uses, owner = {}, {}, {}
    for o in objs:
        name = o[:-2]
        defs[name], uses[name] = symbols(os.path.join(objdir, o), nm)
        for sym in defs[name]:
            owner.setdefault(sym, set()).add(name)
    g = {}
    for name in defs:
        g[name] = {}
        for sym in uses[name]:
            for to in owner.get(sym, ()):
                if to != name:
                    g[name].setdefault(to, []).append(sym)
        for to in g[name]:
            g[name][to].sort()
    return g


def circles(g):
    """The strongly connected components of more than one file, each
    sorted, in sorted order (Tarjan, iterative: no recursion limit)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = 0
    for root in sorted(g):
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(g[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


def main(argv):
    objdir = argv[1] if len(argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "daemon")
    # In daemon/ itself, only the objects of its sources (not stale ones).
    has_src = any(f.endswith(".c") for f in os.listdir(objdir))
    g = graph(objdir, sources=objdir if has_src else None)
    if not g:
        print(f"{objdir}: no objects (make -C daemon first)", file=sys.stderr)
        return 2
    found = circles(g)
    for comp in found:
        print(f"circle of {len(comp)} files: {' '.join(comp)}")
        for a in comp:
            for b in sorted(g[a]):
                if b in comp:
                    print(f"  {a} -> {b}: {', '.join(g[a][b])}")
    if not found:
        print(f"no circles among {len(g)} files")
    print()
    for a in sorted(g):
        if g[a]:
            print(f"{a} -> {' '.join(sorted(g[a]))}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env python3
"""The module graph of actors/src, checked against the layers ARCHITECTURE.md describes.

Usage: scripts/module-graph.py [SRC_DIR] [--edges]

SRC_DIR defaults to actors/src beside this script. Without --edges it checks the graph
and exits 1 naming each import that breaks a rule (file and line); with --edges it
prints every import between top-level modules, one `a -> b` per line, and checks nothing.
Python 3 standard library only.

What is a module: each top-level module of the crate (`foo.rs` or `foo/`); everything
under it counts as it. lib.rs is the crate's root, not a module.

What is an import: a path `crate::foo...` in code (a `use`, or a path in an expression,
type or macro), `crate::{foo, bar::Baz}` groups, and `crate::Name` where lib.rs
re-exports `Name` from module `foo` (`pub use foo::Name`). Comments (doc links
included) and string literals are not code. Test code may import what it likes: a
`#[cfg(test)] mod name { ... }` block, and a file declared `#[cfg(test)] mod name;`,
are left out.

The rules:
1. No import cycle between modules.
2. Imports point down, or across one layer: a module imports nothing of a layer above
   its own (LAYERS, lowest first). "Up" is exactly that: the imported module's layer
   comes later in LAYERS than the importing module's.
3. Within the actors' layer, an actor imports no peer: only the pairs in PEERS (a
   parent and the actor type it starts; an implementation and the trait it implements).
4. Every module has a layer, and every module LAYERS names exists: a new module is
   placed on purpose.
"""

import os
import re
import sys

# Lowest first. Each layer: (what it is, its modules).
LAYERS = [
    (
        "foundation: the data model and helpers that import nothing above them",
        ["model", "mutants", "backoff"],
    ),
    (
        "ports: the backend traits (Kinesis, DynamoDB, CloudWatch) and their adapters",
        ["backend"],
    ),
    (
        "logic, configuration and helpers over the ports: no actor",
        [
            "settings",
            "balance",
            # How many workers the stream needs: a pure function over heartbeat loads.
            "scale",
            "fencing",
            "kpl",
            "metrics",
            "spans",
            "handle",
            "fanout",
            "stream_set",
            "fleet_sim",
            "oracle",
        ],
    ),
    (
        "the metrics reporter: an actor that knows no other part of the worker; the "
        "actors reach it only through telemetry, which wraps its mailbox",
        ["metrics_reporter"],
    ),
    (
        "what the actors share without knowing each other: messages, snapshots, events",
        [
            "protocol",
            "boards",
            "status",
            "status_tree",
            "status_history",
            "status_page",
            "prometheus",
            "telemetry",
            # The failure policy's plan, driver and dead-letter destinations: run by the
            # processor host, below every actor.
            "failure",
        ],
    ),
    (
        "the actors (and the processor API the reader's child speaks)",
        [
            "checkpoint_writer",
            "lease_keeper",
            "shard_reader",
            "stream_watcher",
            "status_server",
            "processor",
            "multilang",
            "renewal",
        ],
    ),
    ("the supervisor: the core actors' parent", ["supervisor"]),
    ("the worker: builds the tree and is its handle", ["worker"]),
]

# The one layer whose members must not import each other, and the imports among them
# that are allowed, with why.
ACTORS = 5
PEERS = {
    ("shard_reader", "processor"): "the reader starts its processor host (its child)",
    ("multilang", "processor"): "a MultiLang child is a Processor",
}


def code_only(text):
    """The text with comments, string literals and character literals blanked (newlines
    kept, so line numbers stay)."""
    out = []
    i, n = 0, len(text)

    def blank(s):
        return "".join("\n" if c == "\n" else " " for c in s)

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(blank(text[i:j]))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(blank(text[i:j]))
            i = j
        elif re.match(r'(?:b|c)?r(#*)"', text[i:i + 260]) and not (
            i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")
        ):
            m = re.match(r'(?:b|c)?r(#*)"', text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append(blank(text[i:j]))
            i = j
        elif c == '"' or (c in "bc" and text.startswith('"', i + 1) and not (
            i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")
        )):
            j = i + (1 if c == '"' else 2)
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(blank(text[i:j + 1]))
            i = j + 1
        elif c == "'":
            # A character literal ('x', '\n', '\u{1F600}', '{'), not a lifetime ('a).
            m = re.match(r"'(?:\\(?:u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)|[^\\'\n])'", text[i:])
            if m:
                out.append(blank(m.group(0)))
                i += m.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


TEST_MOD = re.compile(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*([;{])")


def without_tests(code):
    """`code` with its `#[cfg(test)] mod x { ... }` blocks blanked, and the names of the
    files it declares `#[cfg(test)] mod x;`."""
    test_files, parts, i = [], [], 0
    for m in TEST_MOD.finditer(code):
        if m.start() < i:
            continue
        if m.group(2) == ";":
            test_files.append(m.group(1))
            continue
        parts.append(code[i:m.start()])
        depth, j = 1, m.end()
        while j < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            j += 1
        parts.append("".join("\n" if ch == "\n" else " " for ch in code[m.start():j]))
        i = j
    parts.append(code[i:])
    return "".join(parts), test_files


def group_heads(group):
    """The first segment of each path of a `{...}` group (nested groups included)."""
    heads, depth, item = [], 0, ""
    for ch in group + ",":
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            m = re.match(r"\s*(\w+)", item)
            if m:
                heads.append(m.group(1))
            item = ""
        else:
            item += ch
    return heads


def crate_paths(code):
    """(line, first segment) of every `crate::...` path in `code`."""
    found = []
    for m in re.finditer(r"\bcrate\s*::\s*(\w+|\{)", code):
        line = code.count("\n", 0, m.start()) + 1
        if m.group(1) != "{":
            found.append((line, m.group(1)))
            continue
        depth, j = 1, m.end()
        while j < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            j += 1
        found.extend((line, head) for head in group_heads(code[m.end():j - 1]))
    return found


def reexports(lib_code):
    """Names lib.rs re-exports at the crate's root, each with the module it comes from."""
    names = {}
    for m in re.finditer(r"\bpub\s+use\s+(\w+)\s*::\s*([^;]*);", lib_code):
        module, rest = m.group(1), m.group(2)
        for name in re.findall(r"\b([A-Z]\w*|[a-z_]\w*)\b(?!\s*::)", rest):
            names.setdefault(name, module)
    return names


def module_dir(path):
    """Where the files of the modules `path` declares are."""
    base = os.path.basename(path)
    if base in ("mod.rs", "lib.rs", "main.rs"):
        return os.path.dirname(path)
    return path[:-3]


def graph(src):
    """(modules, {(a, b): (file, line) of the first import}) of the crate at `src`."""
    lib = os.path.join(src, "lib.rs")
    lib_code = without_tests(code_only(open(lib, encoding="utf-8").read()))[0]
    roots = reexports(lib_code)
    modules = set()
    for entry in os.listdir(src):
        full = os.path.join(src, entry)
        if entry.endswith(".rs") and entry not in ("lib.rs", "main.rs"):
            modules.add(entry[:-3])
        elif os.path.isdir(full) and any(f.endswith(".rs") for f in os.listdir(full)):
            modules.add(entry)
    test_only = set()
    files = []
    for root, _, names in os.walk(src):
        for name in sorted(names):
            if name.endswith(".rs"):
                files.append(os.path.join(root, name))
    edges = {}
    # Files declared `#[cfg(test)] mod x;` are found as their parents are read: read
    # parents first (shorter paths first), so a test file is known before it is read.
    for path in sorted(files, key=lambda p: (p.count(os.sep), p)):
        if path in test_only or path == lib:
            continue
        rel = os.path.relpath(path, src)
        first = rel.split(os.sep)[0]
        module = first[:-3] if first.endswith(".rs") else first
        code, tests = without_tests(code_only(open(path, encoding="utf-8").read()))
        here = module_dir(path)
        for name in tests:
            for candidate in (os.path.join(here, name + ".rs"), os.path.join(here, name, "mod.rs")):
                test_only.add(candidate)
                if os.path.isdir(os.path.join(here, name)):
                    for root, _, names in os.walk(os.path.join(here, name)):
                        test_only.update(os.path.join(root, f) for f in names)
        for line, head in crate_paths(code):
            target = head if head in modules else roots.get(head)
            if target is None or target == module or target not in modules:
                continue
            edges.setdefault((module, target), (os.path.relpath(path), line))
    return modules, edges


def cycles(modules, edges):
    """Strongly connected components of more than one module (Tarjan's, iterative)."""
    adjacent = {m: sorted(b for (a, b) in edges if a == m) for m in modules}
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for start in sorted(modules):
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, child = work.pop()
            if child == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            if child < len(adjacent[node]):
                work.append((node, child + 1))
                nxt = adjacent[node][child]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return found


def shortest_cycle(component, edges):
    """A shortest ring of imports within `component`, as modules, first repeated last."""
    inside = set(component)
    best = None
    for start in component:
        previous, frontier, ring = {start: None}, [start], None
        while frontier and ring is None:
            following = []
            for node in frontier:
                for b in sorted(b for (a, b) in edges if a == node and b in inside):
                    if b == start and ring is None:
                        ring, walk = [start], node
                        while walk is not None:
                            ring.append(walk)
                            walk = previous[walk]
                        ring.reverse()
                    elif b not in previous:
                        previous[b] = node
                        following.append(b)
            frontier = following
        if ring is not None and (best is None or len(ring) < len(best)):
            best = ring
    return best


def check(modules, edges):
    """Every broken rule, as lines of text."""
    problems = []
    layer_of = {}
    for number, (_, members) in enumerate(LAYERS):
        for member in members:
            layer_of[member] = number
    for module in sorted(modules - set(layer_of)):
        problems.append(
            f"module {module} has no layer: add it to LAYERS in scripts/module-graph.py"
        )
    for module in sorted(set(layer_of) - modules):
        problems.append(f"LAYERS names {module}, which is not a module of the crate")
    for component in cycles(modules, edges):
        ring = shortest_cycle(component, edges)
        steps = "; ".join(
            f"{a} -> {b} ({edges[(a, b)][0]}:{edges[(a, b)][1]})" for a, b in zip(ring, ring[1:])
        )
        problems.append(f"import cycle among {', '.join(component)}, e.g. {steps}")
    for (a, b), (path, line) in sorted(edges.items()):
        if a not in layer_of or b not in layer_of:
            continue
        if layer_of[b] > layer_of[a]:
            problems.append(
                f"{path}:{line}: {a} imports {b}, which is above it "
                f"({a}: {LAYERS[layer_of[a]][0]}; {b}: {LAYERS[layer_of[b]][0]})"
            )
        elif layer_of[a] == layer_of[b] == ACTORS and (a, b) not in PEERS:
            problems.append(
                f"{path}:{line}: actor module {a} imports its peer {b}: actors share "
                "only what is below them (protocol, status, telemetry)"
            )
    return problems


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    here = os.path.dirname(os.path.abspath(__file__))
    src = args[0] if args else os.path.join(here, "..", "actors", "src")
    modules, edges = graph(src)
    if "--edges" in argv:
        for a, b in sorted(edges):
            print(f"{a} -> {b}")
        return 0
    problems = check(modules, edges)
    for problem in problems:
        print(problem)
    up = sum(1 for p in problems if "which is above it" in p)
    print(
        f"module graph of {os.path.relpath(src)}: {len(modules)} modules in {len(LAYERS)} "
        f"layers, {len(edges)} imports, {len(cycles(modules, edges))} cycles, "
        f"{up} imports pointing up, {len(problems)} problems"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

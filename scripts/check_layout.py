#!/usr/bin/env python3
"""Checks the library's layout from its own includes (a ctest, `layout`):

  1. no file under lib/ includes CLI11 (the CLI lives under apps/);
  2. a folder of lib/kvlab/ (with its sub-folders) includes only the folders it may use (ALLOWED, the same direction as
     the target links in each folder's CMakeLists.txt);
  3. no include cycle between files.

  scripts/check_layout.py [repo root]      exit 0 = all hold; otherwise each violation is printed
"""
import os
import re
import sys

# folder -> folders it may include (besides itself)
ALLOWED = {
    "core": set(),
    "io": {"core"},
    "attention": {"core"},
    "tokenizer": {"core"},
    "eval": {"core"},
    "quant": {"core"},
    "model": {"core", "io", "attention", "tokenizer"},
    # A run's method may name the quantizer storing what it keeps (method_spec.h: snapkv+kivi2).
    "compress": {"core", "attention", "quant"},
    "replay": {"core", "io", "attention", "compress", "quant"},
    "cache": {"core", "attention", "compress", "quant"},
    "generate": {"core", "io", "attention", "tokenizer", "model", "compress", "cache", "quant"},
    "tasks": {"core", "io", "attention", "tokenizer", "model", "compress", "cache", "generate", "eval", "quant"},
    "analysis": {"core", "io", "attention", "compress", "quant"},
}

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]', re.M)


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    lib = os.path.join(root, "lib")
    graph, problems = {}, []
    for dirpath, _, files in os.walk(os.path.join(lib, "kvlab")):
        for f in files:
            if not f.endswith((".h", ".cpp", ".inc")):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, lib)  # kvlab/<folder>/<file>
            parts = rel.split(os.sep)
            if len(parts) < 3:
                problems.append(f"{rel}: every library file lives in a folder of lib/kvlab/")
                continue
            folder = parts[1]
            if folder not in ALLOWED:
                problems.append(f"{rel}: folder '{folder}' is not in the layout (scripts/check_layout.py ALLOWED)")
                continue
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
            deps = []
            for inc in INCLUDE.findall(text):
                if inc.startswith("CLI/"):
                    problems.append(f"{rel}: includes <{inc}>; CLI11 belongs under apps/")
                if not inc.startswith("kvlab/"):
                    continue
                target = inc.split("/")
                if len(target) < 3:
                    problems.append(f"{rel}: includes \"{inc}\", not a kvlab/<folder>/[...]/<file> path")
                    continue
                if target[1] != folder and target[1] not in ALLOWED[folder]:
                    problems.append(f"{rel}: includes \"{inc}\", but {folder}/ may only use "
                                    f"{', '.join(sorted(ALLOWED[folder])) or 'nothing else'}")
                deps.append(inc)
            graph[rel.replace(os.sep, "/")] = deps
    # cycles: depth-first search with colours
    colour, stack = {}, []

    def visit(node):
        colour[node] = 1
        stack.append(node)
        for dep in graph.get(node, []):
            if colour.get(dep) == 1:
                problems.append("include cycle: " + " -> ".join(stack[stack.index(dep):] + [dep]))
            elif colour.get(dep) is None and dep in graph:
                visit(dep)
        stack.pop()
        colour[node] = 2

    for node in sorted(graph):
        if colour.get(node) is None:
            visit(node)
    for p in problems:
        print(p)
    print(f"layout: {len(graph)} files, {sum(len(d) for d in graph.values())} kvlab includes, "
          f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The arrows between the project's folders: which folder's code may include or link which.

Each top-level folder is one library (cmd/ also holds the binary). A folder may use only the
folders listed for it below; the test fails, naming file and line, when a source file includes a
header of another folder it may not use, when a folder's CMakeLists.txt links a library of one, or
when anything outside a folder includes that folder's private headers (<folder>/internal/).
tests/ may use everything and is not checked.

Usage: layering_test.py SOURCE_DIR
"""
import os
import re
import sys

# Folder → the folders its code may use. Written once, here; docs/architecture.md draws it.
ALLOWED = {
    "base": set(),
    "wire": {"base"},
    "http": {"base"},
    "kernels": set(),  # the CPU stand-in (simt/) only through the CUDA headers it stands in for
    "simt": {"kernels"},
    "grammar": {"base"},
    "queue": {"base", "wire"},
    "engine": {"base", "grammar", "kernels"},
    "webhooks": {"base", "queue"},
    "web": set(),  # pages and their assets, bytes only
    "api": {"base", "grammar", "http", "queue", "web", "webhooks", "wire"},
    "workers": {"base", "engine", "grammar", "http", "queue", "wire"},
    "cmd": {"api", "base", "engine", "grammar", "http", "queue", "web", "webhooks", "wire",
            "workers"},
}

# Library target → folder.
LIBRARIES = {
    "hr_base": "base", "hr_wire": "wire", "hr_http": "http", "hr_kernels": "kernels",
    "hr_simt": "simt", "hr_grammar": "grammar", "hr_queue": "queue", "hr_engine": "engine", "hr_engine_cpu": "engine",
    "hr_webhooks": "webhooks", "hr_web": "web", "hr_api": "api", "hr_workers": "workers", "hr_cmd": "cmd",
}

SOURCE_SUFFIXES = (".h", ".cc", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
LINK = re.compile(r"target_link_libraries\(\s*(\w+)([^)]*)\)", re.S)


def check_includes(root):
    problems = []
    for folder in sorted(ALLOWED):
        for dirpath, _, files in os.walk(os.path.join(root, folder)):
            for name in sorted(files):
                if not name.endswith(SOURCE_SUFFIXES):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                with open(path, encoding="utf-8", errors="replace") as f:
                    for lineno, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        parts = m.group(1).split("/")
                        target = parts[0]
                        if len(parts) < 2 or target not in ALLOWED:
                            continue  # a header next to the file, or a system one
                        if target != folder and target not in ALLOWED[folder]:
                            problems.append(f"{rel}:{lineno}: {folder}/ may not include "
                                            f"{m.group(1)} ({folder}/ may use: "
                                            f"{', '.join(sorted(ALLOWED[folder])) or 'nothing'})")
                        elif target != folder and "internal" in parts[1:-1]:
                            problems.append(f"{rel}:{lineno}: {m.group(1)} is private to "
                                            f"{target}/")
    return problems


def check_links(root):
    problems = []
    for folder in sorted(ALLOWED):
        path = os.path.join(root, folder, "CMakeLists.txt")
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for m in LINK.finditer(text):
            target = m.group(1)
            if LIBRARIES.get(target) != folder:
                continue  # an executable, or a test target
            for lib in re.findall(r"\bhr_\w+", m.group(2)):
                used = LIBRARIES.get(lib)
                if used and used != folder and used not in ALLOWED[folder]:
                    line = text[: m.start()].count("\n") + 1
                    problems.append(f"{folder}/CMakeLists.txt:{line}: {target} may not link "
                                    f"{lib} ({folder}/ may not use {used}/)")
    return problems


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    missing = [f for f in ALLOWED if not os.path.isdir(os.path.join(root, f))]
    if missing:
        print(f"layering: folders missing from {root}: {', '.join(missing)}")
        return 1
    problems = check_includes(root) + check_links(root)
    for p in problems:
        print(p)
    if problems:
        print(f"layering: {len(problems)} arrow(s) break the allowed flow")
        return 1
    print(f"layering: ok ({len(ALLOWED)} folders)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

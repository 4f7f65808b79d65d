#!/usr/bin/env python3
"""Lists every command-line flag Megatron-LM's pretraining scripts accept.

Reads megatron/training/arguments.py of a Megatron-LM git repository (a bare mirror is enough)
and writes the flag names, one per line, to tests/data/megatron_flags.txt with a header naming
the commit. The flags come from two places, both read statically (no torch, no import):

  * group.add_argument('--flag', ...) calls in arguments.py (argparse.BooleanOptionalAction
    adds '--no-flag' too);
  * ArgumentGroupFactory(SomeConfig, exclude=[...]).build_group(...) calls, which turn each
    field of a dataclass (megatron/training/argument_utils.py) into a flag: '--field-name', or
    for a bool whose default is not False '--no-field-name' and '--disable-field-name', unless
    the field's metadata {"argparse_meta": {"arg_names": [...]}} names the flags; fields with
    init=False and excluded ones get none.

The tests (tests/cli/megatron_command_test.cc) check that `ptdp plan --emit megatron` prints
only flags of this list, so they do not need the mirror.

Usage: scripts/megatron-flags.py [--repo DIR] [--rev REV] [--out FILE]
"""
import argparse
import ast
import os
import subprocess
import sys

DEFAULT_REPO = "/work/.mirror/NVIDIA+Megatron-LM/repo"
ARGS_PY = "megatron/training/arguments.py"


def git(repo, *args):
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True,
                          text=True).stdout


class Repo:
    def __init__(self, repo, rev):
        self.repo, self.rev = repo, rev
        self.trees = {}

    def text(self, path):
        return git(self.repo, "show", f"{self.rev}:{path}")

    def tree(self, path):
        if path not in self.trees:
            self.trees[path] = ast.parse(self.text(path), filename=path)
        return self.trees[path]

    def find_class(self, name):
        """(path, ClassDef) of the one top-level class `name` under megatron/."""
        out = subprocess.run(["git", "-C", self.repo, "grep", "-l", "-E", rf"^class {name}\b",
                              self.rev, "--", "megatron/*.py"], capture_output=True, text=True)
        paths = [line.split(":", 1)[1] for line in out.stdout.split() if line]
        found = []
        for path in paths:
            for node in self.tree(path).body:
                if isinstance(node, ast.ClassDef) and node.name == name:
                    found.append((path, node))
        if len(found) != 1:
            sys.exit(f"megatron-flags: class {name}: found {len(found)} definitions "
                     f"({', '.join(p for p, _ in found) or 'none'})")
        return found[0]


def const_strings(node):
    """The string constants of a list/tuple literal."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return None


def flag(name, prefix=None):
    return "--" + ((prefix + "_" + name) if prefix else name).replace("_", "-")


def is_bool(annotation):
    """bool, Optional[bool], bool | None, Union[bool, None]: argparse_utils treats them as bool."""
    a = annotation
    if isinstance(a, ast.Name):
        return a.id == "bool"
    if isinstance(a, ast.Constant) and isinstance(a.value, str):  # a string annotation
        return a.value.replace(" ", "") in ("bool", "Optional[bool]", "bool|None")
    if isinstance(a, ast.BinOp) and isinstance(a.op, ast.BitOr):
        sides = [a.left, a.right]
        return any(is_bool(s) for s in sides) and any(
            isinstance(s, ast.Constant) and s.value is None for s in sides)
    if isinstance(a, ast.Subscript):
        base = a.value.attr if isinstance(a.value, ast.Attribute) else getattr(a.value, "id", "")
        args = a.slice.elts if isinstance(a.slice, ast.Tuple) else [a.slice]
        if base == "Optional":
            return is_bool(args[0])
        if base == "Union" and len(args) == 2:
            return is_bool(args[0]) and isinstance(args[1], ast.Constant) and args[1].value is None
    return False


def is_classvar(annotation):
    a = annotation.value if isinstance(annotation, ast.Subscript) else annotation
    name = a.attr if isinstance(a, ast.Attribute) else getattr(a, "id", "")
    return name in ("ClassVar", "InitVar")


def dataclass_fields(repo, name, seen=None):
    """[(field name, flag names)] of the dataclass `name`, bases first (dataclasses.fields)."""
    path, cls = repo.find_class(name)
    fields = {}
    for base in cls.bases:
        base_name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
        if base_name and base_name not in ("object", "Generic", "ABC"):
            for fname, names in dataclass_fields(repo, base_name):
                fields[fname] = names
    for stmt in cls.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        if is_classvar(stmt.annotation):
            continue
        fname = stmt.target.id
        default, init, arg_names = None, True, None
        value = stmt.value
        is_field = (isinstance(value, ast.Call) and
                    getattr(value.func, "id", getattr(value.func, "attr", None)) == "field")
        if is_field:
            for kw in value.keywords:
                if kw.arg == "default":
                    default = kw.value
                elif kw.arg == "init" and isinstance(kw.value, ast.Constant):
                    init = kw.value.value
                elif kw.arg == "metadata" and isinstance(kw.value, ast.Dict):
                    for k, v in zip(kw.value.keys, kw.value.values):
                        if isinstance(k, ast.Constant) and k.value == "argparse_meta" and \
                                isinstance(v, ast.Dict):
                            for mk, mv in zip(v.keys, v.values):
                                if isinstance(mk, ast.Constant) and mk.value == "arg_names":
                                    arg_names = const_strings(mv)
        else:
            default = value
        if not init:
            fields.pop(fname, None)
            continue
        if arg_names:
            names = arg_names
        elif is_bool(stmt.annotation):
            # store_true when the default == False, else store_false with --no-/--disable-.
            false_default = isinstance(default, ast.Constant) and default.value is False
            names = [flag(fname)] if false_default else [flag(fname, "no"), flag(fname, "disable")]
        else:
            names = [flag(fname)]
        fields[fname] = names
    return list(fields.items())


def collect(repo):
    tree = repo.tree(ARGS_PY)
    flags = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef):  # every add_argument is in one
            continue
        # Local list variables a factory's exclude= may name.
        lists = {}
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                    isinstance(node.targets[0], ast.Name):
                strings = const_strings(node.value)
                if strings is not None:
                    lists[node.targets[0].id] = strings
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "add_argument":
                names = [a.value for a in node.args
                         if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                bool_optional = any(
                    kw.arg == "action" and isinstance(kw.value, ast.Attribute) and
                    kw.value.attr == "BooleanOptionalAction" for kw in node.keywords)
                for n in names:
                    if n.startswith("--"):
                        flags.add(n)
                        if bool_optional:
                            flags.add("--no-" + n[2:])
            elif isinstance(func, ast.Name) and func.id == "ArgumentGroupFactory":
                if not node.args or not isinstance(node.args[0], ast.Name):
                    sys.exit(f"megatron-flags: {ARGS_PY}:{node.lineno}: a factory of a class "
                             "this script cannot name")
                exclude = []
                for kw in node.keywords:
                    if kw.arg == "exclude":
                        exclude = const_strings(kw.value)
                        if exclude is None and isinstance(kw.value, ast.Name):
                            exclude = lists.get(kw.value.id)
                        if exclude is None:
                            sys.exit(f"megatron-flags: {ARGS_PY}:{node.lineno}: exclude= is not "
                                     "a list literal")
                for fname, names in dataclass_fields(repo, node.args[0].id):
                    if fname not in exclude:
                        flags.update(n for n in names if n.startswith("--"))
    return flags


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repo", default=DEFAULT_REPO, help="Megatron-LM git directory")
    p.add_argument("--rev", default="HEAD")
    here = os.path.dirname(os.path.abspath(__file__))
    p.add_argument("--out", default=os.path.normpath(os.path.join(here, "..", "tests", "data", "megatron_flags.txt")))
    a = p.parse_args()
    repo = Repo(a.repo, a.rev)
    commit, date = git(a.repo, "log", "-1", "--format=%H %cs", a.rev).split()
    flags = sorted(collect(repo))
    with open(a.out, "w") as out:
        out.write(f"# Megatron-LM command-line flags (megatron/training/arguments.py and the config\n"
                  f"# dataclasses its ArgumentGroupFactory calls turn into flags) at NVIDIA/Megatron-LM\n"
                  f"# {commit} ({date}); {len(flags)} flags.\n"
                  f"# Generated by scripts/megatron-flags.py; do not edit.\n")
        for f in flags:
            out.write(f + "\n")
    print(f"wrote {a.out}: {len(flags)} flags at {commit[:7]} ({date})")


if __name__ == "__main__":
    main()

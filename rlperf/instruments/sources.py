"""Your files parsed once, for the advisor of a script (:mod:`rlperf.instruments.foreign`) and for
the windows' callers (:mod:`rlperf.instruments.windows`): the function a cProfile key names, the
lines of its calls, its loops. Light on purpose: the profiled child imports it at the script's end."""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Iterable

Key = tuple[str, int, str]

_COLLECTORS = ("append", "extend", "add", "put", "print", "add_scalar", "log", "info", "debug", "write")
"""Calls that keep a value for later (a list, a queue, a log) rather than use it in the loop."""


_JITS = frozenset({"njit", "jit", "generated_jit", "vectorize", "guvectorize", "cfunc", "stencil"})
"""numba's decorators that compile a function."""

_MUTATORS = frozenset({"step", "backward", "zero_grad", "append", "extend", "push", "add", "put", "sample", "reset",
                       "save", "load", "train", "learn", "fit", "insert", "pop", "clear", "store", "remember",
                       "copy_", "load_state_dict", "send", "recv", "join", "acquire"})
"""Calls that change something (an env, a network, a buffer): a value that makes one is never only a log's."""


def _pure(expr: ast.AST | None, impure: set[str]) -> bool:
    """Whether ``expr`` computes a value and nothing else: no call of ``impure``, no walrus, no await."""
    for n in ast.walk(expr) if expr is not None else ():
        if isinstance(n, (ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom, ast.Lambda)):
            return False
        if isinstance(n, ast.Call):
            f = n.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name is None or name in impure:
                return False
    return True


def _only_for_logs(stmt: ast.stmt, chosen: set[int], impure: set[str], served: Callable[[ast.Name], bool],
                   loads: dict[str, list[ast.Name]]) -> bool:
    """Whether ``stmt`` serves only the statements in ``chosen`` (see :meth:`Sources.log_only`)."""
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        uses = [use for name in names for use in loads.get(name, [])]
        return len(names) == len(targets) and bool(uses) and _pure(stmt.value, impure) and all(map(served, uses))
    if isinstance(stmt, (ast.If, ast.For, ast.With)):
        inner = [*stmt.body, *getattr(stmt, "orelse", [])]
        heads: list[ast.AST] = ([stmt.test] if isinstance(stmt, ast.If) else [stmt.iter] if isinstance(stmt, ast.For)
                                else [i.context_expr for i in stmt.items])
        return bool(inner) and all(id(c) in chosen for c in inner) and all(_pure(h, impure) for h in heads)
    return False


def _walk_own(node: ast.AST) -> Iterable[ast.AST]:
    """``ast.walk`` of a function or module without the bodies of the functions and classes in it."""
    todo = [node]
    while todo:
        n = todo.pop()
        yield n
        for child in ast.iter_child_nodes(n):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                todo.append(child)


_LOOPS = (ast.For, ast.While, ast.AsyncFor, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _assigned_names(target: ast.AST) -> list[str]:
    """The names an assignment target binds: ``x``, ``self.x`` -> ``x``."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Attribute):
        return [target.attr]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for t in target.elts for n in _assigned_names(t)]
    return []


def _calls(node: ast.AST) -> list[tuple[ast.Call, str | None, int]]:
    """The calls in a function's body (or a module's, its functions' bodies included): each with the
    name it calls (``name(...)``, ``x.name(...)``) and how many loops it is nested in; not the bodies
    of functions, classes and lambdas defined inside a function."""
    out: list[tuple[ast.Call, str | None, int]] = []

    def visit(n: ast.AST, depth: int) -> None:
        for child in ast.iter_child_nodes(n):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)) and n is not node:
                continue
            if isinstance(child, ast.Call):
                f = child.func
                out.append((child, f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None,
                            depth))
            visit(child, depth + isinstance(child, _LOOPS))

    visit(node, 0)
    return out


_ARRAY_MODULES = frozenset({"np", "numpy", "torch", "jnp", "jax", "cp", "cupy", "scipy", "tf", "F", "sp"})
"""The names array libraries are imported as (``F``: torch.nn.functional)."""


class Sources:
    """Your files parsed once: the function a cProfile key names, and the lines of calls inside it."""

    def __init__(self) -> None:
        self.trees: dict[str, ast.Module | None] = {}
        self.texts: dict[str, str] = {}
        self.indexes: dict[Key, tuple[frozenset[str], list[tuple[frozenset[str], frozenset[str]]]] | None] = {}

    def tree(self, file: str) -> ast.Module | None:
        if file not in self.trees:
            try:
                self.texts[file] = open(file, encoding="utf-8").read()
                self.trees[file] = ast.parse(self.texts[file])
            except (OSError, SyntaxError, ValueError):
                self.trees[file] = None
        return self.trees[file]

    def function(self, key: Key) -> ast.AST | None:
        """The node cProfile's ``key`` names: a function, or the module for ``<module>``."""
        tree = self.tree(key[0])
        if tree is None or key[2] == "<module>":
            return tree
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == key[2]:
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                if key[1] in (node.lineno, first):
                    return node
        return None

    def call_lines(self, key: Key, names: Iterable[str], tried: frozenset[str] = frozenset(),
                   receivers: frozenset[str] = frozenset()) -> list[int]:
        """Lines in ``key``'s function that call any of ``names`` (as ``name(...)`` or ``x.name(...)``),
        those on one of ``receivers`` (``x``, ``self.x``) first, then those inside a loop first."""
        if key[2].startswith("<") and key[2] != "<module>":  # a comprehension or lambda: its own line
            return [key[1]]
        node = self.function(key)
        if node is None:
            return []
        wanted = set(names)
        found: list[tuple[bool, int, int]] = []  # (on another receiver, loop depth, line)
        for call, name, depth in _calls(node):
            if name in wanted:
                f = call.func
                on = _assigned_names(f.value) if isinstance(f, ast.Attribute) else []
                found.append((bool(receivers) and not set(on) & receivers, depth, call.lineno))
        if not found:  # called under another name: ``step = fast_step if fixed else slow_step``
            aliases = {target for a in ast.walk(node) if isinstance(a, ast.Assign)
                       and any(isinstance(v, ast.Name) and v.id in wanted for v in ast.walk(a.value))
                       for t in a.targets for target in _assigned_names(t)} - wanted - tried
            if aliases:
                return self.call_lines(key, aliases, tried | wanted, receivers)
        # The most deeply looped call first: the loop's step is the innermost loop.
        return [line for _, _, line in sorted(found, key=lambda t: (t[0], -t[1], t[2]))]

    def calls_by_name(self, key: Key, name: str) -> bool:
        """Whether ``key``'s function calls ``name`` (``bool(call_lines(key, [name]))``, read from an
        index of the names it calls, built once per function: the windows ask it for every call
        recorded without a caller, in every window)."""
        if key[2].startswith("<") and key[2] != "<module>":
            return True
        index = self._call_index(key)
        if index is None:
            return False
        called, assigned = index
        wanted, tried = {name}, set()
        while wanted:
            if wanted & called:
                return True
            tried |= wanted
            wanted = {t for targets, values in assigned if values & wanted for t in targets} - tried
        return False

    def _call_index(self, key: Key) -> tuple[frozenset[str], list[tuple[frozenset[str], frozenset[str]]]] | None:
        """The names ``key``'s function calls (as :meth:`call_lines` walks it), and its assignments:
        (the names bound, the names read)."""
        cache = self.indexes
        if key in cache:
            return cache[key]
        node = self.function(key)
        if node is None:
            cache[key] = None
            return None
        called = {name for _, name, _ in _calls(node) if name is not None}
        assigned = [(frozenset(t for target in a.targets for t in _assigned_names(target)),
                     frozenset(v.id for v in ast.walk(a.value) if isinstance(v, ast.Name)))
                    for a in ast.walk(node) if isinstance(a, ast.Assign)]
        cache[key] = (frozenset(called), assigned)
        return cache[key]

    def bound_to(self, file: str, cls: str) -> frozenset[str]:
        """The names in ``file`` bound to an instance of class ``cls``: ``rb = ReplayBuffer(...)``,
        ``self.buffer = Ring(...) if fast else ReplayBuffer(...)`` -> ``rb``, ``buffer``."""
        tree = self.tree(file)
        names: set[str] = set()

        def bind(target: ast.AST, value: ast.AST) -> None:
            if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) \
                    and len(target.elts) == len(value.elts):
                for t, v in zip(target.elts, value.elts, strict=True):  # a, b = A(), B(): pairwise
                    bind(t, v)
            elif any(isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == cls for c in ast.walk(value)):
                names.update(_assigned_names(target))

        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    bind(target, node.value)
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                bind(node.target, node.value)
        return frozenset(names)

    def steps_loop_items(self, key: Key, name: str = "step") -> bool | None:
        """Whether ``key``'s function calls ``x.name(...)`` on an object a loop around the call picks
        (``for env in envs: env.step(a)``, ``envs[i].step(...)`` in ``for i in ...``, a comprehension
        over envs): a loop over envs, not one over time stepping one env. None: the source is unknown."""
        node = self.function(key)
        if node is None:
            return None
        found = False

        def visit(n: ast.AST, bound: frozenset[str]) -> bool:
            for child in ast.iter_child_nodes(n):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                    continue
                inner = bound
                if isinstance(child, (ast.For, ast.AsyncFor)):
                    inner = bound | set(_assigned_names(child.target))
                elif isinstance(child, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
                    inner = bound | {t for g in child.generators for t in _assigned_names(g.target)}
                if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and child.func.attr == name:
                    nonlocal found
                    found = True
                    receiver = {x.id for x in ast.walk(child.func.value) if isinstance(x, ast.Name)}
                    if receiver & bound:
                        return True
                if visit(child, inner):
                    return True
            return False

        picked = visit(node, frozenset())
        return picked if found else None

    def loop_body_calls(self, key: Key) -> frozenset[str]:
        """The names ``key``'s outermost loops call on every iteration: in their bodies, not under an
        ``if``, a ``match`` or an ``except``, and not in a loop inside them (whose calls repeat)."""
        node = self.function(key)
        if node is None:
            return frozenset()
        names: set[str] = set()

        def visit(n: ast.AST, looping: bool, conditional: bool) -> None:
            for child in ast.iter_child_nodes(n):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                    continue
                if isinstance(child, ast.Call) and looping and not conditional:
                    f = child.func
                    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                    if name:
                        names.add(name)
                if isinstance(child, _LOOPS):
                    if not looping:
                        visit(child, True, False)
                    continue
                visit(child, looping, conditional or (looping and isinstance(
                    child, (ast.If, ast.IfExp, ast.ExceptHandler, ast.match_case))))

        visit(node, False, False)
        return frozenset(names)

    def loops(self, key: Key) -> list[tuple[int, int, str]]:
        """The loops in ``key``'s function: (nesting depth, line, source text), deepest first."""
        node = self.function(key)
        if node is None:
            return []
        found: list[tuple[int, int, str]] = []

        def visit(n: ast.AST, depth: int) -> None:
            for child in ast.iter_child_nodes(n):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    continue
                deeper = depth + isinstance(child, _LOOPS)
                if isinstance(child, _LOOPS):
                    found.append((deeper, child.lineno, ast.get_source_segment(self.texts[key[0]], child) or ""))
                visit(child, deeper)

        visit(node, 0)
        return sorted(found, key=lambda t: (-t[0], t[1]))

    def class_of(self, key: Key) -> str | None:
        """The class whose method ``key`` is (for ``__init__``: the name a construction calls)."""
        tree = self.tree(key[0])
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name == key[2]
                    and key[1] in (f.lineno, min([f.lineno, *(d.lineno for d in f.decorator_list)])) for f in node.body):
                return node.name
        return None

    def methods(self, key: Key) -> set[str]:
        """The method names of the class whose method ``key`` is, with those it inherits from classes in
        the same file; a gymnasium ``Env`` subclass has ``step`` and ``reset`` (empty for a plain function)."""
        tree = self.tree(key[0])
        classes = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)} if tree is not None else {}
        found: set[str] = set()
        todo, seen = [self.class_of(key)], set()
        while todo:
            name = todo.pop()
            if name is None or name in seen:
                continue
            seen.add(name)
            if name == "Env" and name not in classes:
                found |= {"step", "reset"}
                continue
            node = classes.get(name)
            if node is None:
                continue
            found |= {f.name for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
            todo += [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else None
                     for b in node.bases]
        return found

    def enclosing_function(self, file: str, line: int) -> str | None:
        """The innermost function whose source holds ``line`` (``<module>`` outside any)."""
        tree = self.tree(file)
        best: tuple[int, str] | None = None
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None \
                    and node.lineno <= line <= node.end_lineno and (best is None or node.lineno > best[0]):
                best = (node.lineno, node.name)
        return best[1] if best else ("<module>" if tree is not None else None)

    def array_call(self, file: str, line: int) -> bool:
        """Whether the statement on ``line`` hands arrays to a library in one call: a matrix product
        (``@``) or a call of an array library's function (``np.tanh(...)``, ``torch.cat(...)``): its time
        is that call's C work, which no loop overhead explains (unlike ``math.hypot`` on two floats)."""
        tree = self.tree(file)
        for node in ast.walk(tree) if tree is not None else ():
            if getattr(node, "lineno", None) != line:
                continue
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
                return True
            if isinstance(node, ast.Call):
                root = node.func
                while isinstance(root, ast.Attribute):
                    root = root.value
                if isinstance(root, ast.Name) and root.id in _ARRAY_MODULES and root is not node.func:
                    return True
        return False

    def enclosing_loop(self, file: str, line: int) -> int | None:
        """The line of the innermost loop whose body holds ``line`` (comprehensions count), or None."""
        tree = self.tree(file)
        best = None
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, _LOOPS) and node.end_lineno is not None:
                inside = node.lineno < line <= node.end_lineno or (
                    not isinstance(node, (ast.For, ast.While, ast.AsyncFor)) and node.lineno <= line <= node.end_lineno)
                if inside and (best is None or node.lineno >= best):
                    best = node.lineno
        return best

    def owning_loop(self, file: str, line: int) -> int | None:
        """The loop whose own work ``line`` is: the ``for`` or ``while`` it heads (its next item or test,
        every turn), else :meth:`enclosing_loop`'s."""
        tree = self.tree(file)
        heads = any(isinstance(n, (ast.For, ast.While, ast.AsyncFor)) and n.lineno == line
                    for n in (ast.walk(tree) if tree is not None else ()))
        return line if heads else self.enclosing_loop(file, line)

    def result_dropped(self, key: Key, line: int, name: str) -> bool:
        """Whether the loop drops what the call of ``name`` on ``line`` returns, or only collects it for
        later (``f(x)`` as a statement, ``history.append(f(x))``, ``print(f(x))``): work the next
        step does not need. False when the source does not say."""
        node = self.function(key)
        parents = {child: n for n in ast.walk(node) for child in ast.iter_child_nodes(n)} if node is not None else {}
        calls = [c for c in parents if isinstance(c, ast.Call) and c.lineno == line and name == (
            c.func.attr if isinstance(c.func, ast.Attribute) else getattr(c.func, "id", None))]
        for call in calls:
            parent = parents.get(call)
            if isinstance(parent, ast.Expr):
                continue
            collector = parent.func if isinstance(parent, ast.Call) else None
            if collector is None or (collector.attr if isinstance(collector, ast.Attribute)
                                     else getattr(collector, "id", None)) not in _COLLECTORS:
                return False
        return bool(calls)

    def returns_value(self, key: Key) -> bool:
        """Whether ``key``'s function returns a value (a function that returns nothing works by its
        side effects: dropping its result drops nothing)."""
        node = self.function(key)
        if node is None or isinstance(node, ast.Module):
            return False
        todo, found = list(ast.iter_child_nodes(node)), False
        while todo and not found:
            n = todo.pop()
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                continue
            found = isinstance(n, (ast.Return, ast.Yield, ast.YieldFrom)) and getattr(n, "value", None) is not None \
                and not (isinstance(n.value, ast.Constant) and n.value.value is None)
            todo += ast.iter_child_nodes(n)
        return found

    def jit_compiled(self, key: Key) -> bool:
        """Whether ``key``'s function is compiled by numba (``@numba.njit``, ``@jit(nopython=True)``,
        ``@vectorize``...): its loops run as machine code, whatever cProfile charges its Python key
        (numba's dispatcher reports the jitted call to the profiler under the function's code)."""
        node = self.function(key)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
        text = self.texts.get(key[0], "")
        for d in node.decorator_list:
            d = d.func if isinstance(d, ast.Call) else d
            parts = []
            while isinstance(d, ast.Attribute):
                parts.append(d.attr)
                d = d.value
            if isinstance(d, ast.Name):
                parts.append(d.id)
            dotted = ".".join(reversed(parts))
            if parts and parts[0] in _JITS and (dotted.startswith("numba.") or "numba" in text):
                return True
        return False

    def only_checks(self, key: Key) -> bool:
        """Whether ``key``'s function is a check: it asserts (or raises), returns nothing, and writes
        nothing it was given or did not make itself (no assignment into an argument, ``self`` or a
        global, no mutating method called on one, no ``global``/``nonlocal``). Its only effect is the
        exception it may raise: the loop gets nothing from it but the check."""
        node = self.function(key)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or self.returns_value(key):
            return False
        args = node.args
        given = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
        given |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
        made: set[str] = set()
        for n in _walk_own(node):
            if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor, ast.comprehension)):
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                made |= {t.id for t in targets if isinstance(t, ast.Name)}
                made |= {e.id for t in targets if isinstance(t, (ast.Tuple, ast.List)) for e in t.elts
                         if isinstance(e, ast.Name)}
            elif isinstance(n, ast.withitem) and isinstance(n.optional_vars, ast.Name):
                made.add(n.optional_vars.id)
        made -= given

        def root(e: ast.AST) -> str | None:
            while isinstance(e, (ast.Attribute, ast.Subscript)):
                e = e.value
            return e.id if isinstance(e, ast.Name) else None

        checks = False
        for n in _walk_own(node):
            if isinstance(n, (ast.Global, ast.Nonlocal)):
                return False
            if isinstance(n, (ast.Assert, ast.Raise)):
                checks = True
            written: list[ast.AST] = (list(n.targets) if isinstance(n, (ast.Assign, ast.Delete)) else
                                      [n.target] if isinstance(n, (ast.AugAssign, ast.AnnAssign)) else [])
            for t in written:
                if isinstance(t, (ast.Attribute, ast.Subscript)) and root(t) not in made:
                    return False
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
                name = n.func.attr
                if (name in _MUTATORS or name.endswith("_") or name in ("update", "setdefault", "remove")) \
                        and root(n.func.value) not in made:
                    return False
        return checks

    def in_loop(self, key: Key, line: int) -> bool:
        """Whether ``line`` of ``key``'s function is in the body of a loop of that function (a
        comprehension counts whole)."""
        node = self.function(key)
        for loop in ast.walk(node) if node is not None else ():
            if isinstance(loop, _LOOPS) and loop.end_lineno is not None and loop is not node:
                body = isinstance(loop, (ast.For, ast.While, ast.AsyncFor))
                if (loop.lineno < line if body else loop.lineno <= line) and line <= loop.end_lineno:
                    return True
        return False

    def log_only(self, key: Key, log_lines: Iterable[int], impure: Iterable[str]) -> tuple[list[int], bool]:
        """The lines of ``key``'s function that serve only its log calls on ``log_lines``: those
        statements, the assignments whose names nothing else reads (``stats = {"entropy":
        dist.entropy().mean().item(), ...}``, computed to be logged) and the ``if``/``for``/``with``
        around nothing else (``if step % 100 == 0:``, ``for k, v in stats.items():``); and whether
        that is the whole function (a helper that only logs). A value that calls one of ``impure``
        (your functions) or of :data:`_MUTATORS` does work of its own: never in it."""
        node = self.function(key)
        if node is None:
            return [], False
        impure = set(impure) | _MUTATORS
        wanted = set(log_lines)
        # each node's innermost statement, and each statement's enclosing one
        owner: dict[int, ast.stmt] = {}
        up: dict[int, ast.stmt | None] = {}

        def index(n: ast.AST, stmt: ast.stmt | None) -> None:
            for child in ast.iter_child_nodes(n):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                    continue
                if isinstance(child, ast.stmt):
                    up[id(child)] = stmt
                    index(child, child)
                else:
                    if stmt is not None:
                        owner[id(child)] = stmt
                    index(child, stmt)

        index(node, None)
        statements = [n for n in _walk_own(node) if isinstance(n, ast.stmt) and n is not node]
        loads: dict[str, list[ast.Name]] = {}
        for n in _walk_own(node):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                loads.setdefault(n.id, []).append(n)
        chosen = {id(n) for n in statements if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
                  and any(n.lineno <= line <= (n.end_lineno or n.lineno) for line in wanted)}

        def served(use: ast.Name, extra: ast.stmt) -> bool:  # read inside a chosen statement (or ``extra``)
            stmt: ast.stmt | None = owner.get(id(use))
            while stmt is not None:
                if stmt is extra or id(stmt) in chosen:
                    return True
                stmt = up.get(id(stmt))
            return False

        grown = bool(chosen)
        while grown:
            grown = False
            for stmt in statements:
                if id(stmt) not in chosen and _only_for_logs(stmt, chosen, impure, functools.partial(served, extra=stmt),
                                                              loads):
                    chosen.add(id(stmt))
                    grown = True
        picked = [n for n in statements if id(n) in chosen]
        lines = sorted({line for n in picked for line in range(n.lineno, (n.end_lineno or n.lineno) + 1)})
        top = [n for n in getattr(node, "body", []) if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
        return lines, bool(picked) and bool(top) and all(id(n) in chosen for n in top)

    def text(self, key: Key) -> str:
        node = self.function(key)
        if node is None or key[0] not in self.texts:
            return ""
        return ast.get_source_segment(self.texts[key[0]], node) or ""

"""Parse the PTX that ptxgen's emitter writes: module directives, the entry's parameters, register and
shared-memory declarations, labels and instructions (with guards). Anything else is an error that names
the line, because the emulator must never guess."""
from __future__ import annotations

import re
from dataclasses import dataclass, field


class PtxParseError(ValueError):
    pass


@dataclass
class Param:
    name: str
    type: str
    size: int
    offset: int


@dataclass
class Ins:
    line: int
    text: str
    opcode: str
    mods: list  # opcode split on "."
    operands: list  # raw operand strings
    guard: str | None = None
    guard_neg: bool = False


@dataclass
class Module:
    version: str
    target: str
    entry: str
    params: list
    shared: dict  # name → (offset, nbytes)
    shared_bytes: int
    dynamic_shared: str | None
    consts: dict  # name → bytes
    body: list  # Ins
    labels: dict  # name → instruction index
    reg_types: dict = field(default_factory=dict)  # prefix → declared type


_SIZES = {"u64": 8, "s64": 8, "b64": 8, "f64": 8, "u32": 4, "s32": 4, "b32": 4, "f32": 4, "u16": 2, "b16": 2,
          "s16": 2, "u8": 1, "s8": 1, "b8": 1}


def split_operands(s: str) -> list:
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def parse(text: str) -> Module:
    lines = text.splitlines()
    version = target = entry = None
    params, shared, consts, body, labels, reg_types = [], {}, {}, [], {}, {}
    shared_off = 0
    dynamic = None
    in_params = False
    poff = 0
    for n, raw in enumerate(lines, 1):
        line = raw.split("//", 1)[0].strip()
        if not line:
            continue
        if line.startswith(".version"):
            version = line.split()[1]
        elif line.startswith(".target"):
            target = line.split()[1]
        elif line.startswith(".address_size"):
            pass
        elif line.startswith(".extern .shared"):
            dynamic = re.search(r"(\w+)\[\]", line).group(1)
        elif line.startswith(".global"):
            m = re.match(r"\.global \.align (\d+) \.b8 (\w+)\[(\d+)\] = \{(.*)\};", line)
            if not m:
                raise PtxParseError(f"line {n}: unsupported global declaration: {line}")
            consts[m.group(2)] = bytes(int(v) for v in m.group(4).split(","))
        elif line.startswith(".visible .entry"):
            entry = re.match(r"\.visible \.entry (\w+)\(", line).group(1)
            in_params = True
        elif in_params and line.startswith(".param"):
            m = re.match(r"\.param (?:\.align (\d+) )?\.(\w+) (\w+)(?:\[(\d+)\])?,?$", line)
            if not m:
                raise PtxParseError(f"line {n}: unsupported parameter: {line}")
            align = int(m.group(1) or _SIZES[m.group(2)])
            size = int(m.group(4)) if m.group(4) else _SIZES[m.group(2)]
            poff = (poff + align - 1) // align * align
            params.append(Param(m.group(3), m.group(2), size, poff))
            poff += size
        elif line == ")":
            in_params = False
        elif line in ("{", "}") or line.startswith(".maxntid") or line.startswith(".reqntid") or line.startswith(".minnctapersm"):
            pass
        elif line.startswith(".reg"):
            m = re.match(r"\.reg \.(\w+) (%\w+?)<(\d+)>;", line)
            if not m:
                raise PtxParseError(f"line {n}: unsupported register declaration: {line}")
            reg_types[m.group(2)] = m.group(1)
        elif line.startswith(".shared"):
            m = re.match(r"\.shared \.align (\d+) \.b8 (\w+)\[(\d+)\];", line)
            if not m:
                raise PtxParseError(f"line {n}: unsupported shared declaration: {line}")
            align = int(m.group(1))
            shared_off = (shared_off + align - 1) // align * align
            shared[m.group(2)] = (shared_off, int(m.group(3)))
            shared_off += int(m.group(3))
        elif line.endswith(":"):
            labels[line[:-1]] = len(body)
        else:
            for stmt in filter(None, (s.strip() for s in line.split(";"))):
                body.append(_ins(n, stmt))
    if entry is None:
        raise PtxParseError("no .entry found")
    return Module(version, target, entry, params, shared, shared_off, dynamic, consts, body, labels, reg_types)


def _ins(n: int, stmt: str) -> Ins:
    guard, neg = None, False
    if stmt.startswith("@"):
        g, stmt = stmt.split(None, 1)
        neg = g.startswith("@!")
        guard = g[2:] if neg else g[1:]
    parts = stmt.split(None, 1)
    opcode = parts[0]
    ops = split_operands(parts[1]) if len(parts) > 1 else []
    return Ins(n, stmt, opcode, opcode.split("."), ops, guard, neg)

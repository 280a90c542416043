"""The one place PTX text is made: operands and instructions are rendered here, and the module skeleton
(header, entry, parameters, register declarations, shared memory) comes from a jinja2 template."""
from __future__ import annotations

import struct

import jinja2

from . import __version__
from .ir import Imm, Instr, IRError, Label, Mem, Reg, Sym, TensorRef, Vec

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("ptxgen", "templates"),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    autoescape=False,
)


def render_operand(o) -> str:
    if isinstance(o, Reg):
        return o.name
    if isinstance(o, Imm):
        if o.type == "f32":
            return "0f%08X" % struct.unpack("<I", struct.pack("<f", float(o.value)))[0]
        if o.type == "f64":
            return "0d%016X" % struct.unpack("<Q", struct.pack("<d", float(o.value)))[0]
        v = int(o.value)
        return f"0x{v:X}" if o.type.startswith("b") and v > 9 else str(v)
    if isinstance(o, (Sym, Label)):
        return o.name
    if isinstance(o, Mem):
        base = render_operand(o.base)
        return f"[{base}]" if o.offset == 0 else f"[{base}+{o.offset}]" if o.offset > 0 else f"[{base}{o.offset}]"
    if isinstance(o, Vec):
        return "{" + ", ".join(render_operand(r) for r in o.regs) + "}"
    if isinstance(o, TensorRef):
        return f"[{o.tmap.name}, {{{', '.join(render_operand(c) for c in o.coords)}}}]"
    raise IRError(f"cannot render operand {o!r}")


def render_instr(i: Instr) -> str:
    guard = "" if i.pred is None else f"@{'!' if i.pred_neg else ''}{i.pred.name} "
    ops = ", ".join(render_operand(o) for o in i.operands)
    return f"\t{guard}{i.opcode}{' ' + ops if ops else ''};"


def render_body(items) -> str:
    lines = []
    for it in items:
        if isinstance(it, Label):
            lines.append(f"{it.name}:")
        elif isinstance(it, str):  # a comment line from the builder
            lines.append(f"\t// {it}")
        else:
            lines.append(render_instr(it))
    return "\n".join(lines)


_ASCII = str.maketrans({"—": "-", "–": "-", "→": "->", "Σ": "sum ", "×": "x", "·": "*", "≤": "<=", "≥": ">=",
                        "∘": "o", "’": "'", "√": "sqrt", "…": "..."})


def ascii_only(text: str) -> str:
    """ptxas before CUDA 13.5 rejects any non-ASCII byte, comments included."""
    return text.translate(_ASCII).encode("ascii", "replace").decode("ascii")


def render_module(kernel) -> str:
    text = _ENV.get_template("module.ptx.j2").render(
        version=__version__, kernel=kernel, arch=kernel.arch, body=render_body(kernel.body))
    return ascii_only(text)

"""ptxgen: quantized-LLM GPU kernels described in a small Python DSL and emitted as raw PTX.

Importing `ptxgen` is cheap and pulls in neither jinja2 nor cuda-python: the generator (`ptxgen.dsl`,
`ptxgen.emitter`, `ptxgen.kernels`) and the runtime (`ptxgen.runtime`) load on first use.
"""
__version__ = "0.1.0"

"""Fake DCGM Python bindings: a directory of top-level modules, like DCGM's `bindings/python3`.

Not meant to be imported as `gpulens.sim.dcgm.bindings.*`: put this directory on `sys.path`
(or pass it to `gpulens-exporter --dcgm-bindings`) and `import pydcgm`, as with the real bindings.
The modules serve the engine installed with `gpulens.sim.dcgm.hostengine.install`.
"""

"""tensor-arena for Python.

- ``tensor_arena.onnxruntime``: a drop-in ``InferenceSession`` for
  onnxruntime whose CPU memory is tensor-arena's (needs the ``onnxruntime``
  package: ``pip install tensor-arena[onnxruntime]``).
"""

__version__ = "0.1.0"
__all__ = ["__version__"]

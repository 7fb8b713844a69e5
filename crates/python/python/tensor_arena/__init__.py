"""tensor-arena for Python.

- ``tensor_arena.onnxruntime``: a drop-in ``InferenceSession`` for
  onnxruntime whose CPU memory is tensor-arena's (needs the ``onnxruntime``
  package, 1.31 or later: ``pip install 'onnxruntime>=1.31'``, or keep the
  one already installed).
"""

__version__ = "0.1.0"
__all__ = ["__version__"]

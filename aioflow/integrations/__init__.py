"""Integrations with the libraries a training loop already uses: torch, JAX, Hugging Face.

Each module imports its library only when one of its functions is called, so that
``import aioflow`` never imports torch or jax. ``batch(collate="torch")`` and
``batch(collate="jax")`` find their collate functions through ``collate.COLLATES``.
A Hugging Face ``datasets.Dataset`` or ``IterableDataset`` needs no adapter:
``af.from_iterable(ds)`` reads it, and ``af.from_torch_dataset(ds, shuffle=True)`` samples
a map-style one by index.
"""

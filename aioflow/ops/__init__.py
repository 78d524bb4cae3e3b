"""The operators: one module per family, with the helpers only it uses beside it
(``interleave_subs`` of ``interleave``, ``ordering_spill`` of ``ordering``, ``sources_index``
and ``sources_permute`` of ``sources``)."""

"""Offline experiments that reproduce (and go beyond) the papers' results.

``table1``      Table 1 / Figure 1a of the collaborative paper (synthetic setting).
``mechanisms``  every continual-release mechanism and the S&S / DGS baselines side by side.
``frontier``    what privacy costs the default model: share of the non-private gain per ε, trust mode, population.
``plots``       shared plot helpers.
``runner``      the shared engine: seeded paired simulations in parallel processes.
"""

__all__: list[str] = []

"""Offline experiments that reproduce (and go beyond) the papers' results.

``table1``  Table 1 / Figure 1a of the collaborative paper (synthetic setting).
``runner``  the shared engine: seeded paired simulations in parallel processes.
"""

__all__: list[str] = []

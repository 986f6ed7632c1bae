"""What the local and the federated trust modes add to the global mode's flow.

The global mode is the flow itself (:mod:`pipeline.ingestion`, :mod:`pipeline.release`,
:mod:`pipeline.serve`). A mode package reuses it and adds its own parts; the two modes never
import each other (an import contract in ``pyproject.toml``).

Subpackages
-----------
local         devices add the noise: the server ingests reports and releases sums of reports
federated     sites run the global flow on their own users and share their releases
"""

__all__ = ["federated", "local"]

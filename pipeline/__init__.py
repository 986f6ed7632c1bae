"""pipeline: moves data between Kafka, Redis and the math in ``models``.

Modules (each one job; see DESIGN §1):

- ``services`` — start, probe and stop the embedded Tansu broker and ``redis-server`` on
  loopback, with PID files under a state directory; create topics.

The faust app, records, agents, leader timers, the Redis store and the serving code join
this package as the pipeline is built. Submodules are not imported here, so ``import
pipeline`` stays cheap; import the module you need.
"""

__all__ = ["services"]

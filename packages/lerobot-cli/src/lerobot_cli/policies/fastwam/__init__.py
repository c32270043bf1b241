"""FastWAM (LeRobot 0.6.1's world-action model): a Wan2.2 video DiT and an action DiT joined as a
mixture of transformers, sharded by their ``MoTLayer`` units. Built in slices; not registered as a
policy type until it trains."""

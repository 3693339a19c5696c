"""Who the features describe."""

from quiver import Entity, Int64

user = Entity(name="user", join_keys=["user_id"], dtype=Int64, description="A card holder.")
merchant = Entity(name="merchant", join_keys=["merchant_id"], dtype=Int64, description="A card acceptor.")

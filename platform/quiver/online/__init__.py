"""Online store: Redis layout, writer and reader."""

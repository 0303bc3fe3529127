"""asyncio sockets: the per-process Unix-socket endpoint, frame matching, addresses."""

"""envserver: the websocket Gym server, its wire protocol, and the clients."""

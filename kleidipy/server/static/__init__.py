"""The chat page the server sends at ``GET /`` (``chat.html``: one HTML file, plain JS, nothing from the network),
shipped as package data."""

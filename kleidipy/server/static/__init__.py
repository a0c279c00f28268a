"""The chat page the server sends at ``GET /`` (``chat.html``: one HTML file, plain JS, nothing from the network)
and the two scripts it renders Markdown with (``vendor/``: marked and DOMPurify, see ``vendor/README.md``), shipped
as package data."""

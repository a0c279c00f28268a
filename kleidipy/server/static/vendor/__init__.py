"""The chat page's vendored scripts, byte for byte from npm (marked, DOMPurify): versions, SHA-256 and licences in
README.md here. Package data, served at /static/vendor/."""

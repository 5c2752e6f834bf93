"""Small adapters that let third-party packages work with rlax_post's stack."""

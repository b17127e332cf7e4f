"""Testing helpers for harel-ref (optional extras; import the submodules you need)."""

"""selfsup methods: one file each."""

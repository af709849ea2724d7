"""supervised methods: one file each."""

"""semi methods: one file each."""

"""Thin click commands, one per MLproject entry point; no logic lives here."""

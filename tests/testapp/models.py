"""Test-only subject models (the business app uses the engine the same way)."""

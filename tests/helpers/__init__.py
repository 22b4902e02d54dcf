"""Helpers the test files share (tests/README.md); nothing here is a test."""

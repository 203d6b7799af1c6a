"""DSL building blocks shared by every kernel family."""

"""Runtime: architecture detection, dependency floors, kernel compilation and launch."""

"""ncc package."""

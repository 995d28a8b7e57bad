"""Plan: (config, inventory) -> what each resource advertises, and Allocate answers. Pure."""

"""The fault harness: real services, injected faults, and a checker of Castad's promise (`make faults`)."""

"""Azure adapters (extra ``azure``): Table store, blob lease and Storage Queue transport."""

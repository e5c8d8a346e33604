"""Judge-side oracles for differential tests: independent implementations of a lab's pure
functions, written from the contract. They run in the judge only, never in a child."""

"""Wire records of the contract and their msgpack codec. Imports no Faust."""

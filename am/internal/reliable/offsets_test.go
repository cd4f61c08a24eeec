package reliable

// piggybackOffset is where wire puts Header.Piggyback; the conformance shim uses it.
const piggybackOffset = 40

package egress

// Repair runs the periodic repair now (tests).
func (e *Enforcer) Repair() { e.repair() }

package mysql

// SetAfterPreRead sets the upsert's test hook (nil clears it).
func SetAfterPreRead(fn func()) { testHookAfterPreRead = fn }

// SetAfterClaimRead sets ClaimCount's test hook (nil clears it).
func SetAfterClaimRead(fn func()) { testHookAfterClaimRead = fn }

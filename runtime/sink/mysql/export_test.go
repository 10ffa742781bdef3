package mysql

// SetAfterPreRead sets the upsert's test hook (nil clears it).
func SetAfterPreRead(fn func()) { testHookAfterPreRead = fn }

package inbox

// RestoredEpoch is epoch as MarkRestored marks it (an inbox found older
// than the resource's record of it), for the dialects that write the meta
// row with their own statements (runtime/sink/mysql).
func RestoredEpoch(epoch string) string { return restoredPrefix + epoch }

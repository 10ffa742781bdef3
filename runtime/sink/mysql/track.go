package mysql

// TrackChanges: the MySQL upsert always reports which records changed state
// (its pre-read makes Result.Changed exact), so emit.when: Changed has it
// (sink.ChangeTracker).
func (u *upsertEffect) TrackChanges() bool { return true }

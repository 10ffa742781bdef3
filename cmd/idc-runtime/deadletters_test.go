package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

func TestDeadLettersListsWithoutPayloads(t *testing.T) {
	f := newPruneFixture(t, "Table", explicit(time.Hour), time.Hour)
	if code, lines := f.run(t, "migrate"); code != exitOK {
		t.Fatalf("migrate exit %d: %v", code, lines)
	}
	ctx := context.Background()
	long := "evaluation: " + strings.Repeat("x", 500)
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.DeadLetter(ctx, tx, []inbox.DeadLetter{
		{NativeID: "n1", Reason: "message id: header Nats-Msg-Id is missing", Class: "missing_id", Payload: []byte("SECRET-PAYLOAD-1"), Attempts: 1},
		{MessageID: "m2", NativeID: "n2", Reason: "message id: invalid JSON payload", Class: "invalid_json", Payload: []byte("SECRET-PAYLOAD-2"), Attempts: 1},
		{MessageID: "m3", NativeID: "n3", Reason: long, Class: "evaluation", Attempts: 3, PublishedAt: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)},
	}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	list := func(args ...string) deadLetterList {
		t.Helper()
		var out, errOut bytes.Buffer
		if code := dispatch(append([]string{"deadletters", "--config", f.path}, args...), &out, &errOut); code != exitOK {
			t.Fatalf("deadletters %v: exit %d: %s", args, code, errOut.String())
		}
		if strings.Contains(out.String(), "SECRET-PAYLOAD") {
			t.Fatalf("deadletters printed a payload: %s", out.String())
		}
		var l deadLetterList
		if err := json.Unmarshal(out.Bytes(), &l); err != nil {
			t.Fatalf("deadletters output is not one JSON object: %v\n%s", err, out.String())
		}
		return l
	}

	all := list()
	if all.Kind != DeadLetterListKind || all.Total != 3 || len(all.DeadLetters) != 3 || all.Inbox != "app.inbox_prune" {
		t.Fatalf("all: %+v", all)
	}
	first, third := all.DeadLetters[0], all.DeadLetters[2]
	if first.MessageID != "" || first.NativeID != "n1" || first.ReasonClass != "missing_id" || first.Attempts != 1 || first.DeadAt.IsZero() {
		t.Errorf("first dead letter: %+v", first)
	}
	if !third.ReasonTruncated || len([]rune(third.Reason)) != 200 || third.PublishedAt == nil || third.Attempts != 3 {
		t.Errorf("third dead letter (a 512-character reason, published): %+v", third)
	}
	if l := list("--reason", "invalid_json"); l.Total != 1 || l.DeadLetters[0].MessageID != "m2" {
		t.Errorf("--reason invalid_json: %+v", l)
	}
	if l := list("--limit", "1", "--excerpt", "10"); l.Total != 3 || len(l.DeadLetters) != 1 || l.DeadLetters[0].ID != first.ID {
		t.Errorf("--limit 1: %+v (the total counts past the limit)", l)
	}
	if l := list("--id", "m3", "--excerpt", "10"); l.Total != 1 || l.DeadLetters[0].Reason != "evaluatio" && l.DeadLetters[0].Reason != "evaluation" {
		t.Errorf("--id m3 --excerpt 10: %+v", l)
	}
}

func TestDeadLettersUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"deadletters"},
		{"deadletters", "--config", "x.json", "--limit", "-1"},
		{"deadletters", "--limit", "x"},
	} {
		var out, errOut bytes.Buffer
		if code := dispatch(args, &out, &errOut); code != exitUsage {
			t.Errorf("%v: exit %d, want %d", args, code, exitUsage)
		}
	}
	bad := []deadLettersFlags{{reasons: stringList{"poison"}, excerpt: 1, output: "json"}, {limit: -1, excerpt: 1, output: "json"},
		{excerpt: 0, output: "json"}, {excerpt: 5, output: "yaml"}}
	for _, f := range bad {
		if _, err := f.filter(); err == nil {
			t.Errorf("%+v: no error", f)
		}
	}
}

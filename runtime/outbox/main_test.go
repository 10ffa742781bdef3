package outbox

import (
	"os"
	"testing"

	"github.com/idempotency-dev/idc-operator/internal/natstest"
)

// natsURL is the NATS JetStream server of the run (TestMain): the built
// nats-server 2.15.3 the package starts itself, or with IDC_TEST_NATS=system
// the machine's (Debian's 2.9.10 on 127.0.0.1:4222).
var natsURL string

// TestMain starts the package's NATS server: the current nats-server unless
// IDC_TEST_NATS picks the machine's (internal/natstest).
func TestMain(m *testing.M) {
	os.Exit(natstest.MainOne(m, "outbox", &natsURL))
}

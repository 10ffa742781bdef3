package controllers

import (
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("Lag", func() {
	It("shows the broker's backlog in status.lag and the wide Lag column", func() {
		name := "lag-" + randomSuffix()
		stream := newStream(48 * time.Hour)
		secret := name + "-db"
		newSecret(secret, testDSN)
		_, err := js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: name, AckPolicy: jetstream.AckExplicitPolicy})
		Expect(err).NotTo(HaveOccurred())
		for i := range 7 {
			_, err := js.Publish(ctx, strings.ToLower(stream)+".orders", []byte(fmt.Sprint(i)))
			Expect(err).NotTo(HaveOccurred())
		}
		create(newConsumer(name, stream, secret))
		Eventually(func() *int64 { return get(name).Status.Lag }, timeout, interval).Should(HaveValue(Equal(int64(7))))
		Expect(tableRow(name)).To(HaveKeyWithValue("Lag", BeNumerically("==", 7)))
	})
})

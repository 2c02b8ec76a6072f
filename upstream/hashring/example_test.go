package hashring_test

import (
	"fmt"
	"log"

	"github.com/memcgate/memcgate/upstream/hashring"
)

func ExampleRing_Owners() {
	members := []hashring.Member{
		{Host: "10.0.0.1", Port: 11211, Weight: 1},
		{Host: "10.0.0.2", Port: 11211, Weight: 1},
		{Host: "10.0.0.3", Port: 11212, Weight: 1},
	}
	ring, err := hashring.New(hashring.Ketama, members)
	if err != nil {
		log.Fatal(err)
	}
	name := func(i int) string { return fmt.Sprintf("%s:%d", members[i].Host, members[i].Port) }

	fmt.Println("owner:", name(ring.Owner("foo")))
	var order []int
	for i := range ring.Owners("foo") {
		order = append(order, i)
	}
	fmt.Println("failover order:", order)

	// The caller keeps health state; skipping dead members gives the owner
	// the key would have on a ring without them (equal weights, see Owners).
	down := map[int]bool{1: true}
	for i := range ring.Owners("foo") {
		if !down[i] {
			fmt.Println("with 10.0.0.2 down:", name(i))
			break
		}
	}
	// Output:
	// owner: 10.0.0.2:11211
	// failover order: [1 0 2]
	// with 10.0.0.2 down: 10.0.0.1:11211
}

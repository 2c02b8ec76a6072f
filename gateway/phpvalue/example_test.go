package phpvalue_test

import (
	"fmt"
	"strings"

	"github.com/memcgate/memcgate/gateway/phpvalue"
)

func ExampleDecode() {
	// What php-memcached stores for $m->set('k', 42).
	v, err := phpvalue.Decode(1, []byte("42"), 1<<20)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(v.Type, v.Type.ContentType(), v.Text())
	// Output: long text/plain; charset=utf-8 42
}

func ExampleEncode() {
	value := []byte(strings.Repeat("a PHP string ", 1000))
	payload, flags := phpvalue.Encode(value, phpvalue.EncodeOptions{UserFlags: 7})
	// 0x70050: user flags 7, FastLZ (0x40), compressed (0x10), string (0).
	fmt.Printf("flags %#x, under a tenth of the size: %v\n", flags, len(payload) < len(value)/10)

	v, _ := phpvalue.Decode(flags, payload, 1<<20)
	fmt.Println(v.Type, v.UserFlags, string(v.Body) == string(value))
	// Output:
	// flags 0x70050, under a tenth of the size: true
	// string 7 true
}

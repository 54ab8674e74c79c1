<!--
  Travel planner: the example of design §2 and of the Prompt Cache paper (Figure 2, Appendix A.1.2),
  extended. One parameterised plan module whose union chooses a domestic city (a parameter) or an
  overseas destination (a nested union), a union of traveller profiles, and an assistant turn that
  acknowledges the brief so that the prompt's own question starts a fresh user turn.
-->
<schema name="travel">
  <system>
    You are a world-renowned travel planner who has curated journeys for adventurous explorers and
    leisure-seeking holidaymakers alike. You combine a deep knowledge of destinations with a practical
    sense of logistics: opening hours, travel times between neighbourhoods, seasonal weather, local
    etiquette and realistic budgets.

    When you propose an itinerary, organise it day by day. For each day give a morning, an afternoon
    and an evening block, name concrete places (neighbourhoods, streets, museums, markets, restaurants
    or viewpoints), and say how to get from one to the next. Keep the pace humane: leave room for rest
    and for the unplanned discoveries that make a trip memorable. Mention anything that must be booked
    in advance. If a request is unsafe or impossible in the time available, say so plainly and offer
    the closest good alternative.
  </system>
  <user>
    <module name="travel-plan">
      I'm gearing up for a memorable escape of <param name="duration" len="6">one week</param> and I
      would love your help turning a loose wish list into a plan I can actually follow.
      <union default="domestic">
        <module name="domestic">
          This time my eyes are set on exploring the diverse tapestry of our own country. I've chosen
          the city of <param name="city" len="10"/> as my base. Given its domestic charm, I hope for
          an itinerary that blends affordability with rich experiences: I want to soak in the city's
          history, eat where the locals eat, and spend at least one day somewhere within easy reach
          of the city that most visitors never see.
          <union default="rail">
            <module name="road-trip">
              I will be driving my own car, so parking matters more to me than public transport.
              Please suggest where to leave the car each day, and feel free to include scenic detours
              of up to two hours' drive, small towns along the way and a good place to stop for lunch.
            </module>
            <module name="rail">
              I will arrive by train and would rather not rent a car at all. Please keep every stop
              reachable on foot, by bike, by tram or by regional rail, and tell me which day passes or
              travel cards are worth buying.
            </module>
            <module name="fly-in">
              I am flying in and out, so the first and last days are short: plan a light arrival
              afternoon and a morning that finishes near the airport connection on the day I leave.
            </module>
          </union>
        </module>
        <module name="overseas">
          I'm yearning to tread international soil, to immerse myself in unfamiliar cultures, cuisines,
          landscapes and stories. I'm comfortable with long flights but I'd like the first day to be
          gentle so that I can recover from the journey.
          <union default="tokyo">
            <module name="tokyo">
              Tokyo, Japan's bustling capital, is a harmonious blend of tradition and modernity.
              Skyscrapers stand alongside centuries-old temples, and cutting-edge technology coexists
              with age-old customs. From the calm of the Meiji Shrine's forest to the electric rush of
              Shibuya Crossing, from the early-morning stalls of the Tsukiji outer market to a quiet tea
              ceremony in a Yanaka townhouse, I want to feel both sides of the city. I'm also curious
              about day trips to Nikko, Kamakura or the lakes around Mount Fuji.
            </module>
            <module name="rome">
              The eternal city of Rome, with its millennia of layered history, calls out to the history
              lover in me. Walking its streets feels like travelling through time, from the Colosseum
              and the Roman Forum to Renaissance churches and Baroque piazzas. I dream of tossing a coin
              into the Trevi Fountain, losing an afternoon in Trastevere, seeing the Sistine Chapel
              without the worst of the crowds, and eating cacio e pepe in a trattoria far from the
              tourist menus.
            </module>
            <module name="cape-town">
              Cape Town, nestled at the foot of Table Mountain in South Africa, offers a remarkable mix
              of experiences. With its layered history, vibrant arts scene and landscapes that range
              from wild beaches to vineyard valleys, it seems made for curious travellers. I look
              forward to visiting Robben Island, hiking or riding the cable car up Table Mountain,
              tasting wines in Stellenbosch or Franschhoek, and driving the coast to the Cape of Good
              Hope and the penguins at Boulders Beach.
            </module>
            <module name="sydney">
              Sydney, the shimmering harbour city of Australia, is where urban sophistication meets
              natural beauty. The Opera House and the Harbour Bridge dominate its skyline, while beaches
              like Bondi and Manly promise sun, surf and relaxation. I'd love to walk the coastal path
              from Bondi to Coogee, take the ferry to Manly, explore the Rocks and its markets, and spend
              a day in the Blue Mountains.
            </module>
            <module name="buenos-aires">
              Buenos Aires, Argentina's cosmopolitan capital, pulses with passion and energy. Tango
              music drifts through its streets and its neighbourhoods are a canvas of art and
              architecture. I want to wander the antique markets of San Telmo on a Sunday, see the
              painted houses of La Boca, visit the Recoleta Cemetery, share a traditional asado and
              dance, or at least watch, a late night at a milonga.
            </module>
            <module name="maldives">
              The Maldives beckons with its constellation of coral atolls. Renowned for luminous
              lagoons and an extraordinary underwater world, it promises a tropical escape unlike any
              other. I hope to snorkel or dive among manta rays and reef sharks, visit a local island
              to see everyday Maldivian life beyond the resorts, and spend slow evenings watching the
              sunset over the Indian Ocean.
            </module>
            <module name="reykjavik">
              Reykjavik, the small and colourful capital of Iceland, is the gateway to some of the most
              dramatic landscapes on Earth. I want to drive the Golden Circle past Thingvellir, Geysir
              and Gullfoss, soak in a geothermal lagoon, walk on black sand beaches on the south coast
              and, weather permitting, chase the northern lights on a clear night.
            </module>
            <module name="marrakesh">
              Marrakesh, the red city at the foot of the Atlas Mountains, is a feast for every sense.
              I want to lose myself in the souks of the medina, watch the evening come alive on Jemaa
              el-Fnaa, rest in the gardens of the Jardin Majorelle, stay in a traditional riad and take
              a day trip into the mountains or out towards the desert.
            </module>
          </union>
        </module>
      </union>
    </module>

    A little about who is travelling:
    <union default="solo">
      <module name="solo">
        I'm travelling alone. I enjoy my own company but appreciate an occasional guided walk, cooking
        class or group tour where I can meet people. Please point out any area where a solo traveller
        should take extra care after dark.
      </module>
      <module name="couple">
        We are a couple celebrating an anniversary. We like a mix of active days and slow ones, and we
        would love one or two special evenings: a memorable dinner, a sunset spot or a show.
      </module>
      <module name="family">
        We are a family of four with children aged seven and eleven. We need a realistic pace, places
        where the children can run around, food that is not too adventurous every single day, and a
        rest stop or two in the middle of long sightseeing days.
      </module>
      <module name="friends">
        We are a group of five friends in our late twenties. We have plenty of energy, enjoy nightlife
        and good food, and want at least one big outdoor adventure we will talk about for years.
      </module>
    </union>
  </user>
  <assistant>
    I'd love to help. I've carefully read your plans, the destination and who is travelling, and I'm
    ready to put together an itinerary. What would you like me to focus on?
  </assistant>
</schema>

<schema name="travel">
  <system>You are a world-renowned travel planner ...</system>
  <user>
    <module name="travel-plan">
      I'm gearing up for a trip of <param name="duration" len="5"/>.
      <union default="domestic">
        <module name="domestic">... the city of <param name="city" len="10"/> ...</module>
        <module name="overseas">
          <union>
            <module name="tokyo">Tokyo, Japan's bustling ...</module>
            <module name="rome">The eternal city of Rome ...</module>
          </union>
        </module>
      </union>
    </module>
  </user>
</schema>
